"""Example agents for awaken-site, in a package of their own."""
