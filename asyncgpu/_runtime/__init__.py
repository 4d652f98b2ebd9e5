"""The core: devices, streams, events, pools, the completion engine, clocks, graphs, launch hooks, loops."""
