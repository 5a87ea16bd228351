// Command dashboard is the web dashboard behind a Lambda function URL
// (the construct's WebDashboard prop); see lambdamain.Dashboard.
package main

import "github.com/nexjob/nexjob-aws/lambdamain"

func main() { lambdamain.Dashboard(nil) }
