"""Declared step graphs shipped with graphc (package data)."""
