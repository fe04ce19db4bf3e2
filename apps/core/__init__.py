"""Shared primitives: base models, prefixed ids, tenancy scoping, encryption, domain errors.

Imports nothing from other apps.
"""
