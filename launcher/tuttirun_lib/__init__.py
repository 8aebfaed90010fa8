"""tuttirun's implementation: host parsing, rendezvous server, process spawning, mpirun."""
