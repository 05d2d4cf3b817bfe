package proxy

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every Stats field is one counter of the table, under a name of its own,
// and Counters and Stats give the same values.
func TestCountersAreTheStats(t *testing.T) {
	var p Proxy
	for c := range nCounters {
		p.stats.add(c, int64(c)+1)
	}
	s := p.Stats()
	v := reflect.ValueOf(s)
	assert.Equal(t, int(nCounters), v.NumField(), "one counter per Stats field")
	seen := map[int64]bool{}
	for i := range v.NumField() {
		seen[v.Field(i).Int()] = true
	}
	assert.Len(t, seen, int(nCounters), "each field is filled by its own counter")
	names := map[string]bool{}
	for i, c := range p.Counters() {
		assert.Equal(t, int64(i)+1, c.Value)
		assert.True(t, strings.HasSuffix(c.Name, "_total"), c.Name)
		assert.NotEmpty(t, c.Help)
		assert.False(t, names[c.Name], "%s twice", c.Name)
		names[c.Name] = true
	}
}
