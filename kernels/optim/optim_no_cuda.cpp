// Work in progress: filled in by the optimizer commits.
