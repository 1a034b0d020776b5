"""Agents that ship with awaken-site. Each module registers its agents in the catalogue
(``runs.domain.catalogue``) when it is imported; the project wiring imports them."""
