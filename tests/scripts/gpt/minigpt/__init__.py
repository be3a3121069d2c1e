"""A small GPT package in the shape of the popular minimal GPT trainers: model, trainer, config."""
