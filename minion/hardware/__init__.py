"""The node's hardware: inventory (inventory.collect), requirement rules (requirements.check) and the
`minion inventory` / `minion check` commands (commands.register)."""
