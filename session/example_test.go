package session_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/contstore/contstore/session"
)

// A conversation's life: usage is priced and saved; a durable head is
// published through the context-head barrier; a reload resumes it.
func Example() {
	ctx := context.Background()
	st, _ := session.NewMemory(session.Options{})
	prices, _ := session.ParsePrices([]byte(`{"models":{"m":{"input":1,"output":2}}}`))

	conv := session.NewConversation(session.New("m", "low", "be brief"), session.Deps{Store: st, Prices: prices})
	conv.Session.Messages = append(conv.Session.Messages, json.RawMessage(`{"role":"user","content":"hello"}`))
	cost, _ := conv.AddUsage(session.Usage{Model: "m", Tokens: session.Tokens{Input: 1000, Output: 500}})
	saved, _ := conv.Save(ctx)
	fmt.Printf("saved=%v cost=$%.4f title=%q\n", saved, cost, conv.Session.Title)

	reply := append(conv.Session.Messages, json.RawMessage(`{"role":"assistant","content":"hi"}`))
	err := conv.PersistContextHead(ctx, conv.Session.ID, reply)
	fmt.Printf("persisted=%v latched=%v messages=%d\n", err == nil, conv.Head.IsBlocked(conv.Session.ID), len(conv.Session.Messages))

	loaded, _ := st.Load(ctx, conv.Session.ID)
	resumed := session.NewConversation(loaded, session.Deps{Store: st, Prices: prices})
	fmt.Printf("resumed version=%d messages=%d tokens=%d\n", loaded.Version, len(resumed.Session.Messages), resumed.Session.Tokens.Input)
	// Output:
	// saved=true cost=$0.0020 title="hello"
	// persisted=true latched=false messages=2
	// resumed version=2 messages=2 tokens=1000
}
