// Package keyadmin is the operator's access to a fleet's keys in Redis:
// it names the limit key of a rule and values (or of a domain and a
// descriptor) by the front-end's own code (descriptors.Config.LimitKey,
// rls.Config.LimitKey), as serve derives it, reads its window and ban,
// adds and lifts the fleet's bans, and sets, clears and lists the
// overrides of rules. Its results write themselves as the operator
// commands' tables ([Table]) or as JSON ([WriteJSON]).
package keyadmin
