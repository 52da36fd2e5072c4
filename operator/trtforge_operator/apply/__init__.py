"""Apply: carry out a plan's typed actions, one applier per kind (engine.py, deployment.py), their
shared status and Event writes (writes.py), and the pure renderers of the children they write
(children.py) (docs/design.md §"Observe, plan, apply")."""
