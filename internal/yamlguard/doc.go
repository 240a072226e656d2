// Package yamlguard bounds the work of parsing an untrusted YAML file with
// goccy/go-yaml, so that a hostile or corrupt config file is refused in
// linear time and bounded memory instead of exhausting the process.
//
// goccy/go-yaml's parser costs time and memory quadratic in the nesting
// depth (30 KB of "[" takes seconds and more than a gigabyte), and about
// 250 bytes of live heap per token whatever the depth. [Parse] therefore
// counts the tokens on the raw bytes before lexing (so that the lexer never
// holds more than a bounded number), then lexes with go-yaml's own scanner
// and follows the nesting depth of the tokens it produces, the very tokens
// the parser then reads, and only parses a file within [MaxTokens] and
// [MaxDepth]. A refusal is an [*Error] at the line and column where the
// bound was passed.
package yamlguard
