"""The metrics APIs' wire contract as pure code: request paths and JSON answers."""
