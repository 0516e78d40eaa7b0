"""The agent's nodes, one module per node (and the proposals the executor opens)."""
