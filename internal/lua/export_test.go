package lua

// UsesOf reads the uses line of script name, whose text is file, as the
// loader does: it panics where the loader would.
func UsesOf(name, file string) []string { return uses(name, file) }
