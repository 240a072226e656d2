package yamlguard

import (
	"errors"
	"fmt"
	"io"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/scanner"
	"github.com/goccy/go-yaml/token"
)

// Bounds of a YAML file accepted by Parse.
const (
	// MaxDepth is the deepest nesting of collections (flow and block
	// alike). A descriptors file of the deepest descriptors either format
	// accepts stays well below it.
	MaxDepth = 64
	// MaxTokens is the most tokens: words, brackets, commas and colons, as
	// written (quoted text and comments included). It bounds the parser's
	// live heap to about 64 MiB; ten thousand rules of a few settings each
	// stay below it.
	MaxTokens = 1 << 18
)

// Error is a file refused by a bound, at the position where the bound was
// passed (line and column from 1).
type Error struct {
	Line, Column int
	// Msg is a plain sentence, without position.
	Msg string
}

// Error returns "LINE:COL: message".
func (e *Error) Error() string { return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg) }

// Parse parses data as goccy/go-yaml's parser.ParseBytes(data, 0) does, once
// data is known to stay within MaxTokens and MaxDepth; otherwise it returns
// an *Error and parses nothing. Other errors are go-yaml's, unchanged. Its
// time and memory are linear in len(data) up to those bounds.
func Parse(data []byte) (*ast.File, error) {
	if err := countTokens(data); err != nil {
		return nil, err
	}
	tokens, err := tokenize(data)
	if err != nil {
		return nil, err
	}
	return parser.Parse(tokens, 0)
}

// countTokens refuses data if it holds more than MaxTokens tokens, counted
// on the bytes without lexing: every run of characters other than white
// space and [ ] { } , : is one, and each of those five and : is one. The
// count is at least go-yaml's for any ordinary file (a quoted string or a
// comment counts its words, go-yaml one token), so the lexer that follows
// never builds many more than MaxTokens tokens.
func countTokens(data []byte) error {
	n, line, col := 0, 1, 0
	inWord := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c&0xC0 != 0x80 { // not a UTF-8 continuation byte
			col++
		}
		switch c {
		case '\n':
			line, col, inWord = line+1, 0, false
			continue
		case ' ', '\t', '\r':
			inWord = false
			continue
		case '[', ']', '{', '}', ',', ':':
			inWord = false
		default:
			if inWord {
				continue
			}
			inWord = true
		}
		if n++; n > MaxTokens {
			return tooManyTokens(line, col)
		}
	}
	return nil
}

func tooManyTokens(line, col int) error {
	return &Error{Line: line, Column: max(col, 1),
		Msg: fmt.Sprintf("the file has more than %d YAML tokens (words and punctuation); split it or simplify it", MaxTokens)}
}

// block is one open block collection: the column of its entries.
type block struct {
	col int
	seq bool
}

// tokenize lexes data as go-yaml's lexer.Tokenize does, refusing a nesting
// deeper than MaxDepth at the token that opens it. Flow collections nest by
// their brackets; block collections by the columns of their entries ("- "
// and keys), a new one being open while entries move right.
func tokenize(data []byte) (token.Tokens, error) {
	var s scanner.Scanner
	s.Init(string(data))
	var (
		tokens token.Tokens
		open   []block
		flow   int
		prev   *token.Token
	)
	for {
		sub, err := s.Scan()
		if errors.Is(err, io.EOF) {
			break
		}
		// Other errors are kept as invalid tokens, which the parser reports.
		for _, tk := range sub {
			if len(tokens) == MaxTokens {
				line, col := pos(tk)
				return nil, tooManyTokens(line, col)
			}
			tokens.Add(tk)
			before := prev
			prev = tk
			line, col := pos(tk)
			switch tk.Type {
			case token.DocumentHeaderType, token.DocumentEndType:
				open, flow = open[:0], 0
				continue
			case token.SequenceStartType, token.MappingStartType:
				flow++
			case token.SequenceEndType, token.MappingEndType:
				flow = max(flow-1, 0)
				continue
			case token.SequenceEntryType, token.MappingKeyType:
				if flow > 0 {
					continue
				}
				open = enter(open, col, tk.Type == token.SequenceEntryType)
			case token.MappingValueType:
				if flow > 0 {
					continue
				}
				// The mapping's column is its key's, on the same line.
				if kl, kc := pos(before); before != nil && kl == line {
					col = kc
				}
				open = enter(open, col, false)
			default:
				continue
			}
			if len(open)+flow > MaxDepth {
				return nil, &Error{Line: line, Column: col,
					Msg: fmt.Sprintf("the YAML is nested deeper than %d levels", MaxDepth)}
			}
		}
	}
	return tokens, nil
}

// enter returns the open block collections once an entry at col (of a
// sequence if seq, else of a mapping) is read: the ones to its right are
// closed, and it continues the collection at its column or opens one. A
// sequence may sit at the column of the mapping key that holds it.
func enter(open []block, col int, seq bool) []block {
	for len(open) > 0 {
		top := open[len(open)-1]
		switch {
		case top.col > col, top.col == col && top.seq && !seq:
			open = open[:len(open)-1]
			continue
		case top.col == col && top.seq == seq:
			return open
		}
		break
	}
	return append(open, block{col: col, seq: seq})
}

// pos returns where tk starts; 1:1 when unknown.
func pos(tk *token.Token) (int, int) {
	if tk == nil || tk.Position == nil {
		return 1, 1
	}
	return tk.Position.Line, tk.Position.Column
}
