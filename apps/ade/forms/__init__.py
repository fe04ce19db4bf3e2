"""The ADE's forms, one module per area as in views/: they bind an action's input and check its shape;
the services decide the rest (see forms/base.py)."""
