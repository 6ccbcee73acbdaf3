"""``rollway gateway --workers N``: N gateway processes behind one port, each rollout's calls
reaching the process that holds it."""
