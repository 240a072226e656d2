// Command evalbench drives one Redis script the way redis-benchmark drives a
// command, for scripts/redis-cost.sh and scripts/redis-instructions.sh
// (BENCHMARKS.md, "Redis cost per check"): flashgate's script takes a binary hit spec, which
// redis-benchmark cannot send (its arguments are C strings). It is a
// measurement tool, not part of flashgate.
//
//	go run ./cmd/evalbench -addr 127.0.0.1:6379 -kind flashgate -per 16 -c 2 -P 1 -n 200000
//
// Each of -c connections keeps -P script calls in flight (it writes -P calls,
// then reads their replies) until -n requests have been sent in all. A call
// decides -per requests (flashgate: -per requests of -keys keys each in one
// EVALSHA, as the auto-pipeline batches them; textbook and empty: always 1
// request of one key). -kind ratelimit sends no script: per request,
// envoyproxy/ratelimit's INCRBY and EXPIRE of a fixed window's counter
// (flashsale_uid_<key>_<window start>), written together, each of -P
// requests in flight being those two commands. A request's key is rl:<i> for the i-th request when
// -range is 0 (every key fresh), else rl:<random below -range>; with -keys K
// above 1 it hits rl:<…>:0 … rl:<…>:K-1 instead, key j limited to -limit + j
// (the several-keys path, its hits' specs distinct as a rule set's are). With
// -step S (flashgate only) the i-th request passes now = a fixed instant + i·S
// µs (the local clock's argument) and its key is rl:<i mod -range>, so that a
// key meets time passing at a known rate: -range 100 -limit 5 -window W
// with 400·S < W·1000 < 500·S finds every key full with its oldest entry
// just out of the window (one trimmed, then admitted). It prints the
// requests, the calls, and with -cpu the Redis CPU (INFO cpu) per request in
// µs. A reply that is an error stops it with a non-zero status.
package main
