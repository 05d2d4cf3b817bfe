package fingerprint

import "github.com/minio/highwayhash"

// KeyedSum128 returns HighwayHash-128 of b under the key r was parsed with
// (the namespace's secret), as highwayhash.Sum128 writes it: the
// reference implementation's two 64-bit results, each least significant
// byte first. A gateway derives owner ids from a request and its client's
// credential with it: without the key, nobody can tell which credential or
// conversation an id stands for, nor build a request whose id is another's.
func (r *Request) KeyedSum128(b []byte) [16]byte {
	key := r.parser.Key()
	return highwayhash.Sum128(b, key[:])
}
