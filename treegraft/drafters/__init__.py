"""The two drafters; they know nothing of each other or of the scheduler."""
