"""Things that serve requests and yield records: real servers over HTTP, the simulator."""
