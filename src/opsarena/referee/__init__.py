"""The referee: the engine's judging machinery. `contract` (what a check is given and
returns, the check and setup registries), `model` (the challenge file's model), `referee`
(attempts, cadence, back-off, settle window), `nemesis` (the fault registry), `failures`
(the failure table), `probe` (HTTP into a host), `checks` (generic check helpers and the
`health` check), `ownership` (who holds the port).

Importing this package imports none of them and registers nothing: each user imports
the module it needs, so reading a match record never pulls the judging code in.
"""
