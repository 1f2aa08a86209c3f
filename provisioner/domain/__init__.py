"""The domain layer: the control plane's states and rules, as data.

It holds every lifecycle enum, transition table and named set of states (`states`), and imports only
`contracts` and the standard library (plus the error classes, whose base moves to `contracts`), so
every other layer of the control plane may import it and it imports none of them (see
docs/architecture.md)."""
