"""Ray for packfeed's commands: starting or joining a cluster, an embedded local Ray, quieting its
noise, placement on node groups by label, the packing actors' scaling."""
