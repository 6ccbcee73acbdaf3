from rollway.cli.main import main

main()
