"""Tests of the runnable examples."""
