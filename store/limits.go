package store

// evictionBudget bounds the evictions one operation makes, so no script
// runs long.
const evictionBudget = 64

// partitionOwners is each partition's share of MaxOwners.
func (o Options) partitionOwners() int { return o.MaxOwners / o.Partitions }

// partitionBytes is each partition's share of MaxTotalBytes.
func (o Options) partitionBytes() int64 { return o.MaxTotalBytes / int64(o.Partitions) }
