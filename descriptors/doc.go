// Package descriptors is flashgate's descriptors file and its mapping: it
// loads the file (envoyproxy/ratelimit's shape plus flashgate's additions,
// strict YAML, errors at FILE:LINE:COL) and maps a request's attributes (a
// [Request]), whichever front-end read them, to the rate-limit hits of the
// rules it falls under ([Mapper]). docs/configuration.md ("The descriptors
// file") gives the schema; flashsale.yaml is the built-in example.
//
//	cfg, err := descriptors.LoadFile(path)
//	p := descriptors.NewMapper(cfg, keys) // once per Config
//	p.Map(req, shadowAll, &m)             // per request: m.Hits, m.Rules, m.Missing
//
// A descriptor with a value puts its pattern, not the request's value, in
// the limit key; one without puts the request's value. A value that is
// absent or empty never becomes a shared bucket: the rule is skipped, or
// the request refused under on_missing: deny. A value of any length counts:
// window.Keys hashes long or unsafe ones, so a padded value is a bucket of
// its own, never a way around the rule. Paths are matched and keyed in one
// canonical form (path.go), so no spelling of a path walks around a rule.
package descriptors
