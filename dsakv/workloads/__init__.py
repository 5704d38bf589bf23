"""Request sources: Mooncake traces, the simulator's scenarios, the prefix-cache benchmark protocol and
the demo's chat workload."""
