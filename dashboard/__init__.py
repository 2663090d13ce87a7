"""The Flask dashboard. Reads the store through ``agent``'s query functions; never imports
``hooks``, torch or pynvml."""
