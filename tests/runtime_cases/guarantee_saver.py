"""A module a notebook imports, which saves a model on whichever rank calls it (the converter never sees it)."""


def save(model, path):
    model.save_pretrained(path)
    model.config.save_pretrained(path)
