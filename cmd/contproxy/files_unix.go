//go:build unix

package main

import "syscall"

// fileLimit returns the process's open-file limit, 0 when unknown. Go
// raises the soft limit to the hard one at start.
func fileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
