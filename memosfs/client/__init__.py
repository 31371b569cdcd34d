"""What an agent imports: `kv` (KV slots from Python) and `shared` (slots
shared between agents).  Imports nothing of the daemon (only `abi`)."""
