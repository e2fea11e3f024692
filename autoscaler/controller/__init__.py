"""The controller's I/O shell: work queue and workers, one reconcile, watches, leader election."""
