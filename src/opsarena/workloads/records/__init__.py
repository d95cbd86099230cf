"""The records workload: PUT/GET of seeded records against a service, the durability
ledger's re-reads around faults, its failure reasons, and the records server builders
install."""
