"""Observe: read what a pass plans from, and return it as typed, immutable views (views.py); one
gatherer per kind (engine.py, deployment.py). Reads only; never plans (docs/design.md §"Observe, plan,
apply")."""
