"""The knobs applied inside a trial, by interposition: each knob's application in one module."""
