package docscheck

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// A markdown document, split into what the checks read.
type markdown struct {
	// headings are the anchors GitHub gives the document's headings.
	anchors map[string]bool
	// links are the targets of inline links and link definitions.
	links []located
	// spans are the inline code spans, outside fenced blocks.
	spans []located
	// blocks are the fenced code blocks.
	blocks []block
}

// located is a text and the line it starts on.
type located struct {
	text string
	line int
}

// block is a fenced code block: its info string's first word, the line of
// its first line of code, and its code.
type block struct {
	lang string
	line int
	code string
}

var (
	fenceOpen   = regexp.MustCompile("^ {0,3}(```+|~~~+)[ \t]*([^ \t`]*)")
	headingLine = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	inlineLink  = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]*)>?(?:\s+"[^"]*")?\s*\)`)
	linkDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t].*)?$`)
	mdLinkText  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	htmlTag     = regexp.MustCompile(`<[^>]+>`)
)

// parseMarkdown reads src well enough for the checks: fenced blocks,
// headings, code spans and links (those inside code are not links).
func parseMarkdown(src string) markdown {
	md := markdown{anchors: map[string]bool{}}
	lines := strings.SplitAfter(src, "\n")
	// prose is src with fenced blocks blanked out, newlines kept, so that
	// offsets in it give line numbers.
	var prose strings.Builder
	seen := map[string]int{}
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(strings.TrimRight(lines[i], "\r\n"))
		if m == nil {
			if h := headingLine.FindStringSubmatch(strings.TrimRight(lines[i], "\n")); h != nil {
				slug := slugify(h[1])
				if n, dup := seen[slug]; dup {
					seen[slug] = n + 1
					slug += "-" + strconv.Itoa(n+1)
				} else {
					seen[slug] = 0
				}
				md.anchors[slug] = true
			}
			prose.WriteString(lines[i])
			continue
		}
		fence := m[1]
		b := block{lang: m[2], line: i + 2}
		var code strings.Builder
		prose.WriteString("\n")
		for i++; i < len(lines); i++ {
			prose.WriteString("\n")
			if closesFence(lines[i], fence) {
				break
			}
			code.WriteString(lines[i])
		}
		b.code = code.String()
		md.blocks = append(md.blocks, b)
	}
	text := prose.String()
	// Code spans, then links in the text without them.
	lineAt := lineCounter(text)
	noCode := []byte(text)
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := run(text, i, '`')
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := run(text, j, '`')
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		span := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if len(span) >= 2 && span[0] == ' ' && span[len(span)-1] == ' ' && strings.Trim(span, " ") != "" {
			span = span[1 : len(span)-1]
		}
		md.spans = append(md.spans, located{span, lineAt(i)})
		for k := i; k < end+n; k++ {
			if noCode[k] != '\n' {
				noCode[k] = ' '
			}
		}
		i = end + n
	}
	for _, m := range inlineLink.FindAllStringSubmatchIndex(string(noCode), -1) {
		md.links = append(md.links, located{string(noCode[m[4]:m[5]]), lineAt(m[0])})
	}
	for _, m := range linkDef.FindAllStringSubmatchIndex(string(noCode), -1) {
		md.links = append(md.links, located{string(noCode[m[2]:m[3]]), lineAt(m[0])})
	}
	return md
}

// closesFence reports whether line closes a block opened with fence: the
// fence's character, at least as many times, and nothing else.
func closesFence(line, fence string) bool {
	t := strings.TrimRight(strings.TrimLeft(line, " "), " \t\r\n")
	return len(t) >= len(fence) && strings.Trim(t, fence[:1]) == ""
}

// run returns how many c start s[i:].
func run(s string, i int, c byte) int {
	n := 0
	for i+n < len(s) && s[i+n] == c {
		n++
	}
	return n
}

// lineCounter returns a function giving the 1-based line of an offset of
// text.
func lineCounter(text string) func(int) int {
	var newlines []int
	for i, c := range text {
		if c == '\n' {
			newlines = append(newlines, i)
		}
	}
	return func(off int) int { return sort.SearchInts(newlines, off) + 1 }
}

// slugify returns the anchor GitHub gives a heading: its text as rendered,
// lower case, with every character but letters, digits, '_', '-' and spaces
// removed, and spaces made dashes.
func slugify(heading string) string {
	s := mdLinkText.ReplaceAllString(heading, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	s = strings.NewReplacer("`", "", "*", "").Replace(s)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(s)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
