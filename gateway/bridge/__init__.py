"""Stream bridges: the contract (base), its backends (memory, redis) and the provider."""
