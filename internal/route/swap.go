package route

// Swap has Decide follow p instead of Rule until cleanup runs the
// function it registers: c is the test (a *testing.T) whose end restores
// the rule. It lets a test check that a caller goes by the policy; a test
// that swaps must not run in parallel with others that decide.
func Swap(c interface{ Cleanup(func()) }, p func(Offer) Where) {
	old := policy.Swap(&p)
	c.Cleanup(func() { policy.Store(old) })
}
