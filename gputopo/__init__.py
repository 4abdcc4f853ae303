"""gputopo: makes GPU topology schedulable on Kubernetes."""
