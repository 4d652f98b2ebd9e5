"""The data every layer shares: errors, argument checks, records (Timeline), the trace layer protocol, and
publishing public names. Imports nothing else of asyncgpu."""
