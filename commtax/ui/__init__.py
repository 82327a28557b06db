"""The widget and plot glue the lessons share (notebooks never copy it)."""
