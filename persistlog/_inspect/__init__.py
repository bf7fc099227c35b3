"""Checking a destination: what each log holds, its damage, audits of signatures, repair."""
