package store_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

func BenchmarkReserveRecord(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		owners := storetest.Owners(b, n)
		for _, parallel := range []bool{false, true} {
			b.Run(fmt.Sprintf("memory/owners=%d/parallel=%v", n, parallel), func(b *testing.B) {
				s, err := store.NewMemory(store.Options{MaxOwners: 2 * n, MaxTotalBytes: 1 << 40}) // room for all: no turn evicts
				require.NoError(b, err)
				storetest.BenchReserveRecord(b, s, owners, parallel)
			})
		}
	}
}
