package docscheck

import (
	"strings"
)

// word is a shell word after quote removal. A parameter expansion or
// command substitution in it reads as "x", and sets expanded.
type word struct {
	text     string
	expanded bool
	line     int // 0-based, within the script
}

// lexShell splits a script into its simple commands, well enough for the
// commands documents show: quotes, escapes, line continuations, comments,
// expansions, the operators that end a command (newline ; & | ( )), and
// redirections, whose targets it drops.
func lexShell(src string) [][]word {
	var (
		cmds     [][]word
		cur      []word
		w        strings.Builder
		inWord   bool
		expanded bool
		start    int // line of the word being read
		line     int
		redirect bool // the next word is a redirection's target
	)
	begin := func() {
		if !inWord {
			inWord, start = true, line
		}
	}
	endWord := func() {
		if inWord {
			if redirect {
				redirect = false
			} else {
				cur = append(cur, word{w.String(), expanded, start})
			}
		}
		w.Reset()
		inWord, expanded = false, false
	}
	endCommand := func() {
		endWord()
		if len(cur) > 0 {
			cmds = append(cmds, cur)
		}
		cur = nil
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\\' && i+1 < len(src):
			if src[i+1] == '\n' {
				line++
			} else {
				begin()
				w.WriteByte(src[i+1])
			}
			i += 2
		case c == '\'':
			begin()
			j := strings.IndexByte(src[i+1:], '\'')
			if j < 0 {
				j = len(src) - i - 1
			}
			w.WriteString(src[i+1 : i+1+j])
			line += strings.Count(src[i+1:i+1+j], "\n")
			i += j + 2
		case c == '"':
			begin()
			for i++; i < len(src) && src[i] != '"'; {
				switch {
				case src[i] == '\\' && i+1 < len(src) && strings.IndexByte("$`\"\\\n", src[i+1]) >= 0:
					if src[i+1] != '\n' {
						w.WriteByte(src[i+1])
					}
					i += 2
				case src[i] == '$' || src[i] == '`':
					j := skipExpansion(src, i)
					if j == i+1 && src[i] == '$' {
						w.WriteByte('$') // a lone $
					} else {
						w.WriteByte('x')
						expanded = true
					}
					i = j
				default:
					if src[i] == '\n' {
						line++
					}
					w.WriteByte(src[i])
					i++
				}
			}
			i++
		case c == '$' || c == '`':
			begin()
			j := skipExpansion(src, i)
			if j == i+1 && c == '$' {
				w.WriteByte('$')
			} else {
				w.WriteByte('x')
				expanded = true
			}
			i = j
		case c == '#' && !inWord:
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == ' ' || c == '\t' || c == '\r':
			endWord()
			i++
		case c == '\n' || c == ';' || c == '|' || c == '&' || c == '(' || c == ')':
			endCommand()
			if c == '\n' {
				line++
			}
			i++
		case c == '>' || c == '<':
			if inWord && strings.Trim(w.String(), "0123456789") == "" {
				w.Reset() // a file descriptor: 2>&1
				inWord, expanded = false, false
			} else {
				endWord()
			}
			for i++; i < len(src) && strings.IndexByte("<>&", src[i]) >= 0; i++ {
			}
			redirect = true
		default:
			begin()
			w.WriteByte(c)
			i++
		}
	}
	endCommand()
	return cmds
}

// skipExpansion returns the offset after the expansion that starts at
// src[i] ($name, ${...}, $(...), $((...)), `...`); i+1 for a lone $.
func skipExpansion(src string, i int) int {
	if src[i] == '`' {
		if j := strings.IndexByte(src[i+1:], '`'); j >= 0 {
			return i + j + 2
		}
		return len(src)
	}
	if i+1 >= len(src) {
		return i + 1
	}
	switch c := src[i+1]; {
	case c == '(' || c == '{':
		closer := map[byte]byte{'(': ')', '{': '}'}[c]
		depth := 0
		for j := i + 1; j < len(src); j++ {
			switch src[j] {
			case c:
				depth++
			case closer:
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(src)
	case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		j := i + 1
		for j < len(src) && (src[j] == '_' || 'a' <= src[j] && src[j] <= 'z' || 'A' <= src[j] && src[j] <= 'Z' || '0' <= src[j] && src[j] <= '9') {
			j++
		}
		return j
	case strings.IndexByte("0123456789?@*#$!-", c) >= 0:
		return i + 2
	}
	return i + 1
}
