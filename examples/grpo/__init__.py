"""A GRPO loop on rollway's embedded engine: rollouts, an exact on-policy check, one update."""
