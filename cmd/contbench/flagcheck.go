package main

// Checks of flag values beyond a range: the Redis URL, and the path a
// report will be written to, checked before anything runs.

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/redis/go-redis/v9"
)

// checkRedisURL returns a usageError unless u is a URL redis.ParseURL
// takes. The message quotes no part of u, which may hold a password.
func checkRedisURL(u string) error {
	_, err := redis.ParseURL(u)
	if err == nil {
		return nil
	}
	msg := "-redis wants a URL such as redis://127.0.0.1:6379"
	if strings.Contains(u, "://") { // a URL, though not one Redis takes: say why
		var urlErr *url.Error
		detail := strings.TrimPrefix(err.Error(), "redis: ")
		if errors.As(err, &urlErr) {
			detail = urlErr.Err.Error()
		}
		msg += " (" + detail + ")"
	}
	return &usageError{"", msg}
}

// checkOutputPath returns an error unless a file can be written at path,
// without writing it: its directory exists and takes new files, and
// path, when it exists, is a file that can be written. An empty path is
// no file and passes.
func checkOutputPath(path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return fmt.Errorf("cannot write %s: it is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		}
		return f.Close()
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("cannot write %s: directory %s: %w", path, dir, pathCause(err))
	case !fi.IsDir():
		return fmt.Errorf("cannot write %s: %s is not a directory", path, dir)
	}
	probe, err := os.CreateTemp(dir, ".contbench-*")
	if err != nil {
		return fmt.Errorf("cannot write %s: cannot create files in %s: %w", path, dir, pathCause(err))
	}
	return errors.Join(probe.Close(), os.Remove(probe.Name()))
}

// pathCause returns the cause of a file operation's error, without the
// operation and path the message already names.
func pathCause(err error) error {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err
	}
	return err
}
