package session

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Price is one model's price in US dollars per million tokens.
type Price struct {
	Input        float64 `json:"input"`
	Output       float64 `json:"output"`
	CacheRead    float64 `json:"cache_read"`
	CacheWrite5m float64 `json:"cache_write_5m"`
	CacheWrite1h float64 `json:"cache_write_1h"`
}

// Prices maps model names to prices. Prices are data: parse them with
// ParsePrices (see prices.example.json).
type Prices map[string]Price

// ParsePrices decodes a price table, a JSON object {"models": {name:
// Price}}, refusing unknown members and negative prices.
func ParsePrices(b []byte) (Prices, error) {
	var doc struct {
		Models Prices `json:"models"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: price table: %v", ErrInvalid, err)
	}
	for name, p := range doc.Models {
		if p.Input < 0 || p.Output < 0 || p.CacheRead < 0 || p.CacheWrite5m < 0 || p.CacheWrite1h < 0 {
			return nil, fmt.Errorf("%w: price table: model %q has a negative price", ErrInvalid, name)
		}
	}
	return doc.Models, nil
}

// Usage is what one model turn consumed.
type Usage struct {
	// Model is the model that ran the turn, as Prices names it.
	Model string
	// Tokens counts the turn's tokens; CacheCreation is every cache-write
	// token.
	Tokens
	// CacheCreation5m and CacheCreation1h split the cache writes by cache
	// lifetime when the provider says (nil when it does not).
	CacheCreation5m, CacheCreation1h *uint64
}

// Cost returns what u costs and whether the model is in the table. When
// either split is given, cache writes are billed by it; when neither is,
// all of CacheCreation is billed at the 5-minute rate. An unknown model
// costs 0.
func (p Prices) Cost(u Usage) (float64, bool) {
	price, ok := p[u.Model]
	if !ok {
		return 0, false
	}
	const perToken = 1e-6
	cost := float64(u.Input)*price.Input + float64(u.Output)*price.Output + float64(u.CacheRead)*price.CacheRead
	if u.CacheCreation5m != nil || u.CacheCreation1h != nil {
		cost += float64(deref(u.CacheCreation5m))*price.CacheWrite5m + float64(deref(u.CacheCreation1h))*price.CacheWrite1h
	} else {
		cost += float64(u.CacheCreation) * price.CacheWrite5m
	}
	return cost * perToken, true
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}
