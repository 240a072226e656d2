//go:build race

package e2e

// raceEnabled: the tests run with -race, so the flashgate binary is built
// with -race too and timing margins are wider.
const raceEnabled = true
