# Jinja2 templates of the generated script (nbddp/render.py loads them from this package).
