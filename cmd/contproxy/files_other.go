//go:build !unix

package main

// fileLimit returns 0: the open-file limit is unknown here.
func fileLimit() uint64 { return 0 }
