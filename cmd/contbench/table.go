package main

// Text layout: values aligned in columns, prose wrapped to a width.

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// table lays out labelled rows of values in columns.
type table struct {
	cols int // value columns
	rows [][]string
}

// section starts a group of rows; headers head the value columns.
func (t *table) section(name string, headers ...string) {
	for len(headers) < t.cols {
		headers = append(headers, "") // keeps the line in the column blocks
	}
	t.rows = append(t.rows, append([]string{name}, headers...))
}

// row adds a row under the current section.
func (t *table) row(label string, values ...string) {
	t.rows = append(t.rows, append([]string{"  " + label}, values...))
}

// write prints the table.
func (t *table) write(w io.Writer) {
	aligned(w, func(tw io.Writer) {
		for _, r := range t.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
	})
}

// aligned prints to w the tab-separated lines fill writes, their columns
// aligned and no padding left at their ends.
func aligned(w io.Writer, fill func(tw io.Writer)) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	fill(tw)
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

// wrapWidth is the width the report wraps its prose lines to.
const wrapWidth = 100

// writeWrapped prints text as lines of at most wrapWidth bytes where its
// words allow, the lines after the first indented.
func writeWrapped(w io.Writer, text string) {
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) > wrapWidth:
			fmt.Fprintln(w, line)
			line = "    " + word
		default:
			line += " " + word
		}
	}
	fmt.Fprintln(w, line)
}
