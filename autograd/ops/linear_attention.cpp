// placeholder: written in issue 12
