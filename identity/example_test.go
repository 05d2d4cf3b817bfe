package identity_test

import (
	"fmt"

	"github.com/contstore/contstore/identity"
)

// Owners name conversation threads: a session's main thread and each of its
// sub-agents, with keys that never collide.
func Example() {
	main, _ := identity.Main("session-42")
	agent, _ := identity.Agent("session-42", "planner")
	fmt.Println(main.Key(), agent.Key(), agent.IsAgent())

	back, _ := identity.ParseKey(agent.Key())
	fmt.Println(back == agent, back.Session(), back.AgentID())

	_, err := identity.Main("")
	fmt.Println(err)
	// Output:
	// m:session-42 a:session-42:planner true
	// true session-42 planner
	// identity: invalid owner: session id is empty
}
