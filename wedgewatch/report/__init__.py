"""`wedgewatch report` and `wedgewatch bundles`: from an evidence bundle to a page a person reads.

`model` reads a bundle into a `BundleModel` (tolerating missing and corrupt files, and
saying which), `html` and `markdown` render it, `chart` draws the timeline with
matplotlib when the `report` extra is installed.
"""
